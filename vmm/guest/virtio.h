/*
 * Minimal polling virtio-mmio (version 2) drivers for the test guest: the
 * transport, split virtqueues of 8 entries in static memory (the guest's
 * addresses are physical: the VMM identity-maps low memory), and what the
 * block and vsock drivers need. No interrupts: the guest runs with them off
 * and polls the used rings.
 */
#ifndef SANDBOXD_GUEST_VIRTIO_H
#define SANDBOXD_GUEST_VIRTIO_H

#define VQ_SIZE 8

struct vring_desc {
	unsigned long addr;
	unsigned int len;
	unsigned short flags;
	unsigned short next;
};

struct vring_avail {
	unsigned short flags;
	unsigned short idx;
	unsigned short ring[VQ_SIZE];
	unsigned short used_event;
};

struct vring_used_elem {
	unsigned int id;
	unsigned int len;
};

struct vring_used {
	unsigned short flags;
	unsigned short idx;
	struct vring_used_elem ring[VQ_SIZE];
	unsigned short avail_event;
};

#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2

struct vq {
	struct vring_desc desc[VQ_SIZE] __attribute__((aligned(16)));
	struct vring_avail avail __attribute__((aligned(2)));
	struct vring_used used __attribute__((aligned(4)));
	unsigned long notify;  /* address of QueueNotify */
	unsigned int index;
	unsigned short avail_idx;
	unsigned short last_used;
};

/* Sets the device at `base` up as a modern device with the queues given
 * (VERSION_1 is the only feature accepted); returns 0, or -1 if the device
 * is not of `type` or refuses. `dev_features_lo` gets the low feature word. */
int virtio_init(unsigned long base, unsigned int type, struct vq *qs, int nq,
		unsigned int *dev_features_lo);
unsigned int virtio_config32(unsigned long base, unsigned int offset);
void vq_submit(struct vq *q, unsigned short head);
/* The next used entry, or -1 if none yet. */
int vq_poll(struct vq *q, unsigned int *len);
/* Spins until the next used entry. */
int vq_wait(struct vq *q, unsigned int *len);

#endif
